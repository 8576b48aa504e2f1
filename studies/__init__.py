"""The study runner behind study.py: the study file (spec), running its jobs (launch), its numbers (summary)
and its report (report)."""
