"""`python -m workbench.distributed` (under torchrun): one rank of a distributed trial."""

import sys

from torch.distributed.elastic.multiprocessing.errors import record

from workbench.distributed.entry import main

if __name__ == "__main__":
    # record: an exception's traceback reaches torchrun's end-of-run summary ("Root Cause").
    sys.exit(record(main)())
