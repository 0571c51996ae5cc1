"""The ``zerocalc`` command: memory, capacity, comm, measure and serve from a terminal.

Where the answers come from:

- ``memory``, ``capacity`` and ``comm`` answer in-process by default: the request body goes
  through the service's own ASGI app (validation, routes, error handlers) over
  ``httpx.ASGITransport``, so the figures are byte for byte the API's and no server is needed.
  With ``--url`` (or ``ZEROCALC_URL``) the same body goes to a running service instead.
- ``measure`` always talks to a running service (it needs the job runner and the GPU):
  ``--url``, default ``http://127.0.0.1:8000``. It draws a progress bar while the job runs.
- ``serve`` starts uvicorn with one worker (one CUDA context, one job runner).

Modules: ``request`` builds the body from the options (one table of where each goes),
``transport`` asks in-process or over HTTP, ``printer`` prints a table or ``--json``,
``commands`` declares the options and stays thin.
"""

from app.cli.commands import cli, main
from app.cli.request import CliError, build_request, parse_count, parse_size

__all__ = ["CliError", "build_request", "cli", "main", "parse_count", "parse_size"]
