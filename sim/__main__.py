"""``python -m sim`` runs the commsim command."""

from sim.cli import main

raise SystemExit(main())
