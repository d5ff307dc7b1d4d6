-- wrk script: `GET /v1/demo/counts:batchGet` of one owner, owners 1 to
-- 1,000 in turn (the performance guide's cross-check of `limits --floor`):
--   wrk -t2 -c64 -d6s -s bench/wrk/get.lua http://127.0.0.1:8080
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", string.format("/v1/demo/counts:batchGet?owners=%d&keys=likes", n % 1000 + 1))
end
