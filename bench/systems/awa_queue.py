"""Adapter for our package (awa-queue, built from this repository in release mode)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import awa_family
from common import main

FLAVOUR = awa_family.Flavour()

if __name__ == "__main__":
    main(awa_family.workloads(FLAVOUR), lambda: awa_family.describe(FLAVOUR))
