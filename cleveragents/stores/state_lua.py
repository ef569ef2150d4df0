"""The Lua that stores a Celery task state without overwriting a finished one.

Shared by the worker's result backend (``cleveragents.broker.redis.result_backend``: every state
a task stores) and the guard store's bind-and-start script (``stores/redis.py``: a
first delivery's ``STARTED``), so that both keep the same rule: a stored
``SUCCESS`` is never overwritten, and where asked, neither is a ``FAILURE``.
"""

from __future__ import annotations

__all__ = ["STORE_STATE_LUA"]

#: Defines ``store_state(key, value, ttl, keep_failure)``: sets ``value`` under
#: ``key`` (for ``ttl`` seconds; 0 or nil: no expiry) unless the state stored there
#: is ``SUCCESS``, or ``FAILURE`` with ``keep_failure``; true when it set it.
STORE_STATE_LUA = """
local function store_state(key, value, ttl, keep_failure)
  local current = redis.call('GET', key)
  if current then
    local ok, meta = pcall(cjson.decode, current)
    if ok and type(meta) == 'table' then
      if meta.status == 'SUCCESS' or (keep_failure and meta.status == 'FAILURE') then
        return false
      end
    end
  end
  local seconds = tonumber(ttl)
  if seconds and seconds > 0 then
    redis.call('SET', key, value, 'EX', seconds)
  else
    redis.call('SET', key, value)
  end
  return true
end
"""
