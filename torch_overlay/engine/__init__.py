"""The overlay in a live process: decide patches, run patched module code, swap late, report."""
