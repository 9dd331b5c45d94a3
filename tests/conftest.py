import os
import sys

# tests import their shared helpers (the scalar oracle) as plain modules
sys.path.insert(0, os.path.dirname(__file__))
