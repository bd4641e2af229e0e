import sys
from pathlib import Path

# the helpers module sits next to the tests; importlib import mode does not add this folder
sys.path.insert(0, str(Path(__file__).parent))
