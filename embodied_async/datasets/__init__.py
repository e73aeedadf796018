"""Datasets of demonstrations in LeRobot's format v3.0: written (``writer.py``), read
(``reader.py``) and turned into supervised batches for a policy."""
