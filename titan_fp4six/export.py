"""``python -m titan_fp4six.export``: a torchtitan checkpoint as a Hugging Face folder (titan_fp4six/integration/export.py)."""

import sys

if __name__ == "__main__":
    from titan_fp4six.integration.export import main

    sys.exit(main())
