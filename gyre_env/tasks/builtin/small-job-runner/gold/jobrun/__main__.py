from jobrun.cli import main

raise SystemExit(main())
