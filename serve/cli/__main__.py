"""``python -m serve.cli``: what a detached ``serve start`` runs, and the tests' way in."""

from serve.cli.main import main

main()
