from csvq.cli import main

raise SystemExit(main())
