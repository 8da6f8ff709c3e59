from wordcount.cli import main

raise SystemExit(main())
