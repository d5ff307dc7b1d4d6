-- wrk script: `POST /v1/demo/counters:observe` of one member, owners 1 to
-- 1,000 in turn (the performance guide's cross-check of `limits --floor`):
--   wrk -t2 -c64 -d6s -s bench/wrk/observe.lua http://127.0.0.1:8080
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local n = 0
request = function()
  n = n + 1
  local body = string.format('{"observations":[{"owner":%d,"key":"viewers","member":"m%d"}]}', n % 1000 + 1, n)
  return wrk.format(nil, "/v1/demo/counters:observe", nil, body)
end
