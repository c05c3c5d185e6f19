import os
import tempfile

# Keep the overlay's compiled-code cache of test runs out of the user's cache.
os.environ.setdefault("TORCH_OVERLAY_CACHE_DIR", tempfile.mkdtemp(prefix="torch_overlay_cache_"))

# The overlay first, as a training job imports it: a test module that imports torch's internals
# before torch_overlay would otherwise leave every later module's patches on the late path.
import torch_overlay  # noqa: E402, F401
