"""Webhooks following the Standard Webhooks convention (https://www.standardwebhooks.com).

Pure: :mod:`signing` (sign/verify), :mod:`events` (payloads, event filter, retry schedule).
I/O: :mod:`delivery` (queue, HTTP send, delivery log, per-tenant secrets).
"""
