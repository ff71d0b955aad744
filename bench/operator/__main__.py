from bench.operator.run import main

raise SystemExit(main())
