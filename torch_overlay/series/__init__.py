"""A patch series as data: parse patch files, match hunks, decide what a patch does to a tree."""
