-- wrk script: `POST /v1/demo/counters:add`, owners 1 to 1,000 in turn, no
-- key (the performance guide's cross-check of `limits --floor`):
--   wrk -t2 -c64 -d6s -s bench/wrk/add.lua http://127.0.0.1:8080
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local n = 0
request = function()
  n = n + 1
  local body = string.format('{"owner":%d,"key":"likes"}', n % 1000 + 1)
  return wrk.format(nil, "/v1/demo/counters:add", nil, body)
end
