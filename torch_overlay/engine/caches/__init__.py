"""What a warm ``import torch`` recalls instead of redoing, kept in one private folder.

:mod:`.folder` is the folder (entries verified before they are believed); :mod:`.record` the one
way every kind of entry is keyed, versioned, checked, stored and loaded. The kinds: the series
index (:mod:`.series_index`), activation per torch release (:mod:`.activation_memo`), a component's
decision (:mod:`.decision_record`), and the compiled code of a patched module or of a late swap
(:mod:`.compiled_code`). Nothing outside this folder reads or writes the folder but through a record.
"""
