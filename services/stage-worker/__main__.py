import sys

from shardline.stage_worker.server import main

sys.exit(main())
