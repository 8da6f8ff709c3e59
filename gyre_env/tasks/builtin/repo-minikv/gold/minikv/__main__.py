from minikv.cli import main

raise SystemExit(main())
