"""Code that runs wherever user code runs: standard library only, CPython >= 3.8.

The modules here are loaded two ways: as ``coordex.worker.*`` inside the host, and by
path from an environment's interpreter that does not have coordex installed (the
worker program puts this folder on ``sys.path``). Their names start with ``_coordex_``
so they never shadow a user's module.
"""
