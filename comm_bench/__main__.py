"""``python -m comm_bench``: the commbench command (also what torchrun's ``-m`` runs)."""

from comm_bench.cli import main

raise SystemExit(main())
