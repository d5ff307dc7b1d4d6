"""Calling counter-service from Python through a client generated from its
OpenAPI document: every call of call.sh, with the answers parsed into the
generated models (a body that is not the documented type fails to parse)
and any status the document does not list raised as an error.

    pip install openapi-python-client
    curl -s http://127.0.0.1:8080/openapi.json > openapi.json
    openapi-python-client generate --path openapi.json --meta none \
        --output-path counter_service_client
    python examples/service/generated_client.py http://127.0.0.1:8080 .

The second argument is the folder holding `counter_service_client`. CI
runs this against the binary (`.ci/run`).
"""

import datetime
import random
import sys

sys.path.insert(0, sys.argv[2] if len(sys.argv) > 2 else ".")

from counter_service_client import Client  # noqa: E402
from counter_service_client.api.admin import compact, job  # noqa: E402
from counter_service_client.api.counters import (  # noqa: E402
    add,
    add_and_get,
    batch_add,
    observe,
)
from counter_service_client.api.counts import (  # noqa: E402
    counts_batch_get,
    keys,
    series,
    top,
    uniques_batch_get,
)
from counter_service_client.api.operations import readyz  # noqa: E402
from counter_service_client.models import (  # noqa: E402
    AddAndGetReply,
    AddReply,
    AddRequest,
    BatchAddReply,
    BatchAddRequest,
    BatchGetReply,
    BatchItem,
    Job,
    KeysReply,
    Observation,
    ObserveReply,
    ObserveRequest,
    ProblemBody,
    Readiness,
    SeriesReply,
    TopReply,
    UniquesReply,
)

BASE = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080"
NS = "demo"
RUN = str(random.randrange(10**9))
client = Client(base_url=BASE, raise_on_unexpected_status=True)


def at(text):
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def expect(what, answer, kind, check):
    """Prints the call and fails unless its answer is `kind` and `check` holds."""
    print(f"{what:28} {answer!r}"[:160])
    if not isinstance(answer, kind):
        sys.exit(f"{what}: expected a {kind.__name__}, got {answer!r}")
    if not check(answer):
        sys.exit(f"{what}: unexpected {answer!r}")


# An add with an Idempotency-Key, and its retry: applied once, the same answer.
like = AddRequest(owner=RUN, key="likes", delta=2)
first = add_and_get.sync(NS, client=client, body=like, idempotency_key=f"like-{RUN}")
expect("add and get", first, AddAndGetReply, lambda a: a.total == 2)
again = add_and_get.sync(NS, client=client, body=like, idempotency_key=f"like-{RUN}")
expect("the same add, retried", again, AddAndGetReply, lambda a: a.total == 2)
other = add.sync(NS, client=client, body=AddRequest(owner=RUN, key="likes", delta=5), idempotency_key=f"like-{RUN}")
expect("the key, another body", other, ProblemBody, lambda p: p.status == 409 and p.kind == "conflict")
plain = add.sync(NS, client=client, body=AddRequest(owner=int(RUN) + 1, key="likes"))
expect("an add, owner as a number", plain, AddReply, lambda a: a.applied)

# Many adds in one request, each with its id; a windowed key with its time.
batch = BatchAddRequest(
    items=[
        BatchItem(id=f"v1-{RUN}", owner=RUN, key="views", delta=3, at=at("2026-11-02T10:00:00Z")),
        BatchItem(id=f"h1-{RUN}", owner=RUN, key="reaction:heart"),
    ]
)
expect("batch add", batch_add.sync(NS, client=client, body=batch), BatchAddReply, lambda a: a.applied == 2)
expect("batch add, retried", batch_add.sync(NS, client=client, body=batch), BatchAddReply, lambda a: a.duplicates == 2)

# Reads: a batch get (zero-filled), a ranking, a series, the keys.
counts = counts_batch_get.sync(NS, client=client, owners=f"{RUN},0", keys="likes,views,reaction:heart")
expect(
    "batch get",
    counts,
    BatchGetReply,
    lambda r: r.counts[RUN].to_dict() == {"likes": 2, "views": 3, "reaction:heart": 1}
    and r.counts["0"].to_dict() == {"likes": 0, "views": 0, "reaction:heart": 0},
)
expect("top", top.sync(NS, client=client, key="likes", limit=3), TopReply, lambda r: len(r.owners) >= 1)
window = series.sync(NS, client=client, owner=RUN, key="views", from_=at("2026-11-01T00:00:00Z"), to=at("2026-11-04T00:00:00Z"))
expect("series", window, SeriesReply, lambda r: r.sum_ == 3 and len(r.buckets) == 3)
expect("keys", keys.sync(NS, client=client), KeysReply, lambda r: "reaction:heart" in r.in_use)

# Unique counts: a repeat, or a retried request, counts once.
seen = ObserveRequest(
    observations=[
        Observation(owner=RUN, key="viewers", member="ann", at=at("2026-11-02T10:00:00Z")),
        Observation(owner=RUN, key="viewers", member="bob", at=at("2026-11-02T11:00:00Z")),
        Observation(owner=RUN, key="viewers", member="ann", at=at("2026-11-03T09:00:00Z")),
    ]
)
expect("observe", observe.sync(NS, client=client, body=seen), ObserveReply, lambda r: r.observed == 3)
expect("observe, retried", observe.sync(NS, client=client, body=seen), ObserveReply, lambda r: r.observed == 3)
viewers = uniques_batch_get.sync(NS, client=client, owners=RUN, keys="viewers")
expect("distinct viewers", viewers, UniquesReply, lambda r: r.uniques[RUN].to_dict() == {"viewers": 2})
third = uniques_batch_get.sync(
    NS, client=client, owners=RUN, keys="viewers", from_=at("2026-11-03T00:00:00Z"), to=at("2026-11-04T00:00:00Z")
)
expect("viewers on the 3rd", third, UniquesReply, lambda r: r.uniques[RUN].to_dict() == {"viewers": 1})

# Maintenance is a job, followed to its end.
started = compact.sync(NS, client=client)
expect("compact", started, Job, lambda j: j.state.value in ("running", "done"))
for _ in range(3000):
    followed = job.sync(NS, started.id, client=client)
    if followed.state.value != "running":
        break
expect("compact, followed", followed, Job, lambda j: j.state.value == "done" and j.report is not None)

# Errors are problem details with a kind.
unknown = add.sync(NS, client=client, body=AddRequest(owner=RUN, key="nope"))
expect("an unknown key", unknown, ProblemBody, lambda p: p.status == 400 and p.kind == "invalid_input")
expect("ready", readyz.sync(client=client), Readiness, lambda r: r.status == "ready")
print("every call answered its documented type")
