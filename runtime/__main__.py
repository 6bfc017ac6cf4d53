"""``python -m radixlm.runtime [flags]`` serves, like ``radixlm serve``."""

import sys

from radixlm.runtime.cli import main

args = sys.argv[1:]
sys.exit(main(args if args[:1] in (["serve"], ["generate"], ["router"], ["-h"], ["--help"]) else ["serve", *args]))
