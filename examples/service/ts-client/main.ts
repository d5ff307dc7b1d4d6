// counter-service from TypeScript, through types generated from its OpenAPI
// document alone (openapi-typescript) and openapi-fetch: every route, each
// answer checked, under `tsc --strict`. A total of 9223372036854775807 is
// read back exactly by asking for `application/json; int64=string`, which
// the document types as strings. Every answer's body is validated against
// the document's schema for its status and media type (conforms.ts, Ajv).
//
//   npm install
//   npx openapi-typescript http://127.0.0.1:8080/openapi.json -o api.d.ts
//   npx tsc && node dist/main.js http://127.0.0.1:8080
//
// CI runs it against the binary on every backend (`.ci/run`).

import createClient from "openapi-fetch";
import type { components, paths } from "./api.js";
import { conformance } from "./conforms.js";

type Problem = components["schemas"]["ProblemBody"];

const base = process.argv[2] ?? "http://127.0.0.1:8080";
const ns = "demo";
const run = String(Math.floor(Math.random() * 1e9));
const path = { ns };

/** Integers as JSON numbers (the default media type); problems as problems. */
const client = createClient<paths, "application/json" | "application/problem+json">({ baseUrl: base });
/** The same API, every integer of its answers a string. */
const exact = createClient<paths, "application/json; int64=string" | "application/problem+json">({
  baseUrl: base,
  headers: { Accept: "application/json; int64=string" },
});

/** Every answer of both checked against the document (conforms.ts). */
const conforms = await conformance(base);
client.use(conforms.middleware);
exact.use(conforms.middleware);

let calls = 0;

/** Exits with `why`, and the answers unlike the document so far. */
function fail(why: string): never {
  console.error(why);
  if (conforms.failures.length > 0) console.error(`answers unlike the document:\n${conforms.failures.join("\n")}`);
  process.exit(1);
}

/** Prints the call; exits unless `ok`. */
function expect(what: string, ok: boolean, shown: unknown): void {
  calls += 1;
  console.log(`${what.padEnd(30)} ${JSON.stringify(shown)}`.slice(0, 160));
  if (!ok) fail(`${what}: unexpected answer`);
}

/** The data of an answer that must have succeeded. */
function data<T>(what: string, answer: { data?: T; error?: unknown; response: Response }): T {
  if (answer.data === undefined) fail(`${what}: ${answer.response.status} ${JSON.stringify(answer.error)}`);
  return answer.data;
}

/** The first event of an event stream: its name and data. */
async function firstEvent(response: Response): Promise<{ event: string; data: unknown }> {
  const reader = response.body!.pipeThrough(new TextDecoderStream()).getReader();
  let text = "";
  while (!text.includes("\n\n")) {
    const { value, done } = await reader.read();
    if (done) break;
    text += value;
  }
  await reader.cancel();
  const block = text.slice(0, text.indexOf("\n\n"));
  const line = (prefix: string) =>
    block.split("\n").find((l) => l.startsWith(prefix))?.slice(prefix.length).trim() ?? "";
  return { event: line("event:"), data: JSON.parse(line("data:")) };
}

// Adds: keyed, retried, and a key reused with another body.
const like = { owner: run, key: "likes", delta: 2 };
const key = { "Idempotency-Key": `ts-like-${run}` };
const first = data("add and get", await client.POST("/v1/{ns}/counters:addAndGet", { params: { path, header: key }, body: like }));
expect("add and get", first.total === 2, first);
const again = data("retried", await client.POST("/v1/{ns}/counters:addAndGet", { params: { path, header: key }, body: like }));
expect("the same add, retried", again.total === 2, again);
const reused = await client.POST("/v1/{ns}/counters:add", { params: { path, header: key }, body: { ...like, delta: 5 } });
const conflict: Problem | undefined = reused.error;
expect("the key, another body", conflict?.status === 409 && conflict.kind === "conflict", conflict);
const plain = data("add", await client.POST("/v1/{ns}/counters:add", { params: { path }, body: { owner: Number(run) + 1, key: "likes" } }));
expect("an add, owner as a number", plain.applied, plain);
const batch = {
  items: [
    { id: `v1-${run}`, owner: run, key: "views", delta: 3, at: "2026-11-02T10:00:00Z" },
    { id: `h1-${run}`, owner: run, key: "reaction:heart" },
  ],
};
const added = data("batch add", await client.POST("/v1/{ns}/counters:batchAdd", { params: { path }, body: batch }));
expect("batch add", added.applied === 2, added);

// Reads.
const counts = data(
  "batch get",
  await client.GET("/v1/{ns}/counts:batchGet", { params: { path, query: { owners: `${run},0`, keys: "likes,views,reaction:heart" } } }),
);
expect("batch get", counts.counts[run]?.["likes"] === 2 && counts.counts["0"]?.["views"] === 0, counts);
const posted = data("batch get (POST)", await client.POST("/v1/{ns}/counts:batchGet", { params: { path }, body: { owners: [run], keys: ["views"] } }));
expect("batch get (POST)", posted.counts[run]?.["views"] === 3, posted);
const ranking = data("top", await client.GET("/v1/{ns}/top", { params: { path, query: { key: "likes", limit: 3 } } }));
expect("top", ranking.owners.length >= 1, ranking);
const window = data(
  "series",
  await client.GET("/v1/{ns}/series", { params: { path, query: { owner: run, key: "views", from: "2026-11-01T00:00:00Z", to: "2026-11-04T00:00:00Z" } } }),
);
expect("series", window.sum === 3 && window.buckets.length === 3, window);
const declared = data("keys", await client.GET("/v1/{ns}/keys", { params: { path } }));
expect("keys", declared.in_use.includes("reaction:heart"), declared);
const namespaces = data("namespaces", await client.GET("/v1/namespaces"));
expect("namespaces", namespaces.namespaces.some((n) => n.name === ns), namespaces);

// Unique counts.
const observations = [
  { owner: run, key: "viewers", member: "ann", at: "2026-11-02T10:00:00Z" },
  { owner: run, key: "viewers", member: "bob", at: "2026-11-02T11:00:00Z" },
  { owner: run, key: "viewers", member: "ann", at: "2026-11-03T09:00:00Z" },
];
const observed = data("observe", await client.POST("/v1/{ns}/counters:observe", { params: { path }, body: { observations } }));
expect("observe", observed.observed === 3, observed);
const viewers = data("uniques", await client.GET("/v1/{ns}/uniques:batchGet", { params: { path, query: { owners: run, keys: "viewers" } } }));
expect("distinct viewers", viewers.uniques[run]?.["viewers"] === 2, viewers);
const third = data(
  "uniques (POST)",
  await client.POST("/v1/{ns}/uniques:batchGet", { params: { path }, body: { owners: [run], keys: ["viewers"], from: "2026-11-03T00:00:00Z", to: "2026-11-04T00:00:00Z" } }),
);
expect("viewers on the 3rd", third.uniques[run]?.["viewers"] === 1, third);

// Live: a watch stream's first event, of totals and of a ranking.
const watched = await client.GET("/v1/{ns}/counts:watch", { params: { path, query: { owners: run, keys: "likes" } }, parseAs: "stream" });
const snapshot = await firstEvent(watched.response);
expect("watch", snapshot.event === "snapshot" && JSON.stringify(snapshot.data).includes('"likes":2'), snapshot);
const leaders = await client.GET("/v1/{ns}/top:watch", { params: { path, query: { key: "likes", limit: 3 } }, parseAs: "stream" });
const board = await firstEvent(leaders.response);
expect("watch the ranking", board.event === "snapshot", board);

// Maintenance: jobs, followed; a clear.
const checked = data("check", await client.POST("/v1/{ns}/admin:check", { params: { path, query: { dry_run: true } } }));
expect("check (dry run)", checked.kind === "check_dry_run", checked);
const compacted = data("compact", await client.POST("/v1/{ns}/admin:compact", { params: { path } }));
let job = compacted;
for (let i = 0; i < 3000 && job.state === "running"; i++) {
  job = data("job", await client.GET("/v1/{ns}/admin/jobs/{id}", { params: { path: { ns, id: compacted.id } } }));
}
const report = job.report;
expect("compact, followed", job.state === "done" && report !== null && report !== undefined && "rows_before" in report, job);
const jobs = data("jobs", await client.GET("/v1/{ns}/admin/jobs", { params: { path } }));
expect("jobs", jobs.jobs.length >= 2, jobs.jobs.length);
const cleared = data("clear", await client.POST("/v1/{ns}/counters:clear", { params: { path }, body: { owners: [Number(run) + 1], keys: ["likes"] } }));
expect("clear", cleared.rows_deleted >= 1, cleared);

// Operations.
const health = await client.GET("/healthz", { parseAs: "text" });
expect("healthz", health.response.status === 200, health.data);
const ready = data("readyz", await client.GET("/readyz"));
expect("readyz", ready.database.ok, ready.status);
const metrics = await client.GET("/metrics", { parseAs: "text" });
expect("metrics", (metrics.data ?? "").includes("counter_service_requests_total"), "text");
const document = await client.GET("/openapi.json");
expect("openapi.json", document.response.status === 200, "document");

// Past 2^53: exact as strings (typed `string` by the document).
const big = `${run}9`;
const max = data(
  "add past 2^53",
  await exact.POST("/v1/{ns}/counters:addAndGet", { params: { path }, body: { owner: big, key: "likes", delta: "9223372036854775807" } }),
);
const total: string = max.total;
expect("add 9223372036854775807", total === "9223372036854775807", max);
const read = data("read past 2^53", await exact.GET("/v1/{ns}/counts:batchGet", { params: { path, query: { owners: big, keys: "likes" } } }));
const exactly: string | undefined = read.counts[big]?.["likes"];
expect("read it back exactly", exactly === "9223372036854775807", read);
const lossy = data("as a number", await client.GET("/v1/{ns}/counts:batchGet", { params: { path, query: { owners: big, keys: "likes" } } }));
expect("as a JavaScript number", lossy.counts[big]?.["likes"] === 9223372036854775807, lossy);

// Errors: problem details, their kind an enum.
const unknown = await client.POST("/v1/{ns}/counters:add", { params: { path }, body: { owner: run, key: "nope" } });
const kind: components["schemas"]["ProblemKind"] | undefined = unknown.error?.kind;
expect("an unknown key", unknown.response.status === 400 && kind === "invalid_input", unknown.error);

if (conforms.failures.length > 0) fail("the answers were as expected, but not all as documented");
console.log(`${calls} calls answered as documented, ${conforms.validated()} bodies valid against its schemas (Ajv)`);
