"""Sessions on a Ray cluster (SPEC section 10): one more place behind the Session protocol.

``node`` is the coordex actor of one node (it runs the same shell and worker code the
server runs, and owns their processes); ``place`` is the Executor's side of it.
Ray is imported only when a cluster is joined: without the ``ray`` extra the rest of
coordex works, and ``Executor(cluster=...)`` says what to install.
"""

from .place import EnvRef, NodeLost, RayCluster, RayPlace, RaySession, import_ray

__all__ = ["EnvRef", "NodeLost", "RayCluster", "RayPlace", "RaySession", "import_ray"]
