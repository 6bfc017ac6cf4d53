import sys

from radixlm.runtime.cli import main

sys.exit(main())
