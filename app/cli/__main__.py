"""``python -m app.cli``: the same as the ``zerocalc`` command."""

from app.cli import main

main()
