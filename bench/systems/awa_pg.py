"""Adapter for awa-pg 0.6.9 from PyPI: the API we are compatible with, as the baseline."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import awa_family
from common import main

FLAVOUR = awa_family.AwaPg()

if __name__ == "__main__":
    main(awa_family.workloads(FLAVOUR), lambda: awa_family.describe(FLAVOUR))
