"""``python -m clearlm`` runs the command-line interface."""

from clearlm.cli import main

main()
