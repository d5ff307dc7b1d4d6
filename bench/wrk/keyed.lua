-- wrk script: `POST /v1/demo/counters:add` with an `Idempotency-Key` (a new
-- one per request, so every add is applied), owners 1 to 1,000 in turn
-- (the performance guide's cross-check of `limits --floor`):
--   wrk -t2 -c64 -d6s -s bench/wrk/keyed.lua http://127.0.0.1:8080
-- Each wrk thread keys its requests with its own prefix, so two threads
-- never send the same key.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local n = 0
local prefix
setup = function(thread)
  thread:set("id", tostring(math.random(1, 1e9)))
end
init = function()
  prefix = id .. "-" .. tostring(os.time())
end
request = function()
  n = n + 1
  local body = string.format('{"owner":%d,"key":"likes"}', n % 1000 + 1)
  -- A table of headers replaces wrk.headers, so it carries the type too.
  local headers = {
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = prefix .. "-" .. n,
  }
  return wrk.format(nil, "/v1/demo/counters:add", headers, body)
end
