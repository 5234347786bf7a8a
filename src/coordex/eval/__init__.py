"""``coordex eval``: how an agent's choice of coordinates over long tasks compares with
the two fixed policies (SPEC section 13).

- :mod:`.kit` the helpers sessions import (standard library only);
- :mod:`.data` the generated data and the two ``ledgerlib`` wheels;
- :mod:`.tasks` what a step and a task are; :mod:`.suite` the twelve tasks;
- :mod:`.runner` one Executor per task, the fixed policies; :mod:`.model` an
  OpenAI-compatible endpoint driving a task;
- :mod:`.measures` redone work, coordinates, from outputs and the call log;
- :mod:`.report` report.json, report.md, report.png and the printed table;
- :mod:`.command` the ``coordex eval`` command line.

Nothing here is imported by ``coordex`` itself.
"""
