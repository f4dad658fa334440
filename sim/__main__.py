"""``python -m sim`` runs the commsim command."""

from sim.cli.main import main

raise SystemExit(main())
