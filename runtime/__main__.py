"""``python -m radixlm.runtime [flags]`` serves, like ``radixlm serve``."""

import sys

# `python -m` puts the working directory first on sys.path. In a radixlm checkout its top-level folders
# (kernels/, lang/, ...) would then shadow installed packages of the same names: transformers imports
# Hugging Face's `kernels`. radixlm imports through its install, never through that entry, so it goes
# (unless -P kept it off).
if not sys.flags.safe_path:
    del sys.path[0]

from radixlm.runtime.cli import main  # noqa: E402
from radixlm.runtime.serve.process_utils import exit_now  # noqa: E402

args = sys.argv[1:]
COMMANDS = ("serve", "generate", "router", "build-kernels", "models", "-h", "--help")
exit_now(main(args if args[:1] and args[0] in COMMANDS else ["serve", *args]))
