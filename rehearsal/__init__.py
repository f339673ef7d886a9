"""The trn2 night rehearsed on cpu (issue 34): the workflow's own steps on stand-ins, in a scratch dir.

Nothing in harness/ or recipes/ imports this package; a rehearsal is never a trn2 result.
"""
