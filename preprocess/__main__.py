import gc
import sys

from preprocess.cli import main

if __name__ == "__main__":  # the guard lets Beam's multi-processing and Dask workers import this safely
    status = main()
    # Everything is written and closed. Interpreter shutdown would run the cycle collector over every object
    # Apache Beam's import created (about 0.3 s); frozen objects are skipped, and the process is exiting.
    gc.freeze()
    sys.exit(status)
