from bench.autoscale.run import main

raise SystemExit(main())
