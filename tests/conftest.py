import os
import tempfile

# Keep the overlay's compiled-code cache of test runs out of the user's cache.
os.environ.setdefault("TORCH_OVERLAY_CACHE_DIR", tempfile.mkdtemp(prefix="torch_overlay_cache_"))
