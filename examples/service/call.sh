#!/usr/bin/env bash
# Calling counter-service from any language: here, curl. Against the demo
# (`cargo run -p counter-service`), or any service whose namespace `demo`
# has the keys `likes`, `views` (day window) and `viewers` (unique, day window):
#
#   examples/service/call.sh [BASE_URL] [TOKEN]
#
# Each call prints its answer; the script stops at the first that differs
# from what it expects (CI runs it against the binary on every backend).
set -euo pipefail
BASE=${1:-http://127.0.0.1:8080}
AUTH=()
[ -n "${2:-}" ] && AUTH=(-H "Authorization: Bearer $2")
RUN=$RANDOM$RANDOM # fresh owners and keys on every run

call() { # call METHOD PATH [BODY] [IDEMPOTENCY-KEY]
  local args=(-sS -X "$1" "$BASE$2" "${AUTH[@]}")
  [ -n "${3:-}" ] && args+=(-H 'Content-Type: application/json' -d "$3")
  [ -n "${4:-}" ] && args+=(-H "Idempotency-Key: $4")
  curl "${args[@]}"
}
expect() { # expect WHAT ANSWER PATTERN
  printf '%-28s %s\n' "$1" "$2"
  grep -qE -- "$3" <<<"$2" || { echo "expected $3" >&2; exit 1; }
}

# An add with an Idempotency-Key, and its retry: applied once, the same answer.
first=$(call POST /v1/demo/counters:addAndGet "{\"owner\": \"$RUN\", \"key\": \"likes\", \"delta\": 2}" "like-$RUN")
expect "add and get" "$first" '"total":2'
again=$(call POST /v1/demo/counters:addAndGet "{\"owner\": \"$RUN\", \"key\": \"likes\", \"delta\": 2}" "like-$RUN")
expect "the same add, retried" "$again" '"total":2'
# The same key with another body is refused.
expect "the key, another body" "$(call POST /v1/demo/counters:add "{\"owner\": \"$RUN\", \"key\": \"likes\", \"delta\": 5}" "like-$RUN")" '"status":409'

# Many adds in one request, each with its id; a windowed key with its time.
batch="{\"items\": [
  {\"id\": \"v1-$RUN\", \"owner\": \"$RUN\", \"key\": \"views\", \"delta\": 3, \"at\": \"2026-11-02T10:00:00Z\"},
  {\"id\": \"h1-$RUN\", \"owner\": \"$RUN\", \"key\": \"reaction:heart\"}]}"
expect "batch add" "$(call POST /v1/demo/counters:batchAdd "$batch")" '"applied":2'
expect "batch add, retried" "$(call POST /v1/demo/counters:batchAdd "$batch")" '"duplicates":2'

# Reads: a batch get (zero-filled), a ranking, a series, the keys.
expect "batch get" "$(call GET "/v1/demo/counts:batchGet?owners=$RUN,0&keys=likes,views,reaction:heart")" \
  "\"$RUN\":\\{\"likes\":2,\"reaction:heart\":1,\"views\":3\\}"
expect "top" "$(call GET '/v1/demo/top?key=likes&limit=3')" '"owners":\['
expect "series" "$(call GET "/v1/demo/series?owner=$RUN&key=views&from=2026-11-01T00:00:00Z&to=2026-11-04T00:00:00Z")" '"sum":3'
expect "keys" "$(call GET /v1/demo/keys)" '"reaction:heart"'

# Unique counts: members observed (a repeat, or a retried request, counts
# once), read for all time and as the union of a range of days.
observed="{\"observations\": [
  {\"owner\": \"$RUN\", \"key\": \"viewers\", \"member\": \"ann\", \"at\": \"2026-11-02T10:00:00Z\"},
  {\"owner\": \"$RUN\", \"key\": \"viewers\", \"member\": \"bob\", \"at\": \"2026-11-02T11:00:00Z\"},
  {\"owner\": \"$RUN\", \"key\": \"viewers\", \"member\": \"ann\", \"at\": \"2026-11-03T09:00:00Z\"}]}"
expect "observe" "$(call POST /v1/demo/counters:observe "$observed")" '"observed":3'
expect "observe, retried" "$(call POST /v1/demo/counters:observe "$observed")" '"observed":3'
expect "distinct viewers" "$(call GET "/v1/demo/uniques:batchGet?owners=$RUN&keys=viewers")" "\"$RUN\":\\{\"viewers\":2\\}"
expect "viewers on the 3rd" \
  "$(call GET "/v1/demo/uniques:batchGet?owners=$RUN&keys=viewers&from=2026-11-03T00:00:00Z&to=2026-11-04T00:00:00Z")" \
  "\"$RUN\":\\{\"viewers\":1\\}"

# Errors are problem details with a kind.
expect "an unknown key" "$(call POST /v1/demo/counters:add "{\"owner\": \"$RUN\", \"key\": \"nope\"}")" '"kind":"invalid_input"'
expect "ready" "$(call GET /readyz)" '"status":"ready"'
