"""Job lifecycle: retry/billing policies (pure) and the fenced writes of the workflow's tasks.

Pure modules: :mod:`retry`, :mod:`classify`, :mod:`decide`, :mod:`billing`.
I/O modules (boto3 clients passed in): :mod:`ledger`, :mod:`publish`, :mod:`cancel`, :mod:`jobio`.
"""
