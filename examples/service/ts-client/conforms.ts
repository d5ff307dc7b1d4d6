// Every answer checked against the OpenAPI document by a validator that is
// not the service's: Ajv (JSON Schema 2020-12, the dialect of OpenAPI 3.1).
// The types of api.d.ts are erased at run time; this proves the bytes the
// service sent are what the document says, for each status and media type.

import { Ajv2020, type ValidateFunction } from "ajv/dist/2020.js";
import type { Middleware } from "openapi-fetch";

/** The parts of an OpenAPI document this reads. */
interface Document {
  paths: Record<string, Record<string, { responses?: Record<string, Response_> }>>;
  components?: unknown;
}
interface Response_ {
  content?: Record<string, { schema?: object }>;
}

/** Answers checked, by outcome. */
export interface Conformance {
  /** A middleware for openapi-fetch: each answer is checked as it arrives. */
  middleware: Middleware;
  /** Bodies validated against their schema. */
  validated: () => number;
  /** What did not conform, one line each. */
  failures: string[];
}

/** Reads the document `base` serves and checks answers against it. */
export async function conformance(base: string): Promise<Conformance> {
  const document = (await (await fetch(`${base}/openapi.json`)).json()) as Document;
  // `format` (int64, uuid, date-time) is the types' business: the values
  // are checked by `type`, `minimum` and the enums; `strict: false` lets
  // OpenAPI's own keywords (`discriminator`, `example`) through.
  const ajv = new Ajv2020({ strict: false, validateFormats: false, allErrors: true });
  const compiled = new Map<string, ValidateFunction>();
  const failures: string[] = [];
  let validated = 0;

  /** The validator of one response schema; its `$ref`s point into the
   *  document's components, carried along under the same path. */
  const validator = (key: string, schema: object): ValidateFunction => {
    let validate = compiled.get(key);
    if (!validate) {
      validate = ajv.compile({ ...schema, components: document.components });
      compiled.set(key, validate);
    }
    return validate;
  };

  const middleware: Middleware = {
    async onResponse({ request, response, schemaPath }) {
      const method = request.method.toLowerCase();
      const what = `${request.method} ${schemaPath} ${response.status}`;
      const responses = document.paths[schemaPath]?.[method]?.responses;
      const documented = responses?.[String(response.status)] ?? responses?.["default"];
      if (!documented) {
        failures.push(`${what}: the status is not documented`);
        return;
      }
      const type = response.headers.get("content-type") ?? "";
      const content = documented.content ?? {};
      // The exact media type first (`application/json; int64=string` is
      // its own entry), then without parameters.
      const media = type in content ? type : type.split(";")[0]!.trim();
      const entry = content[media];
      if (!entry) {
        // No content documented: the answer must have none either.
        const listed = Object.keys(content);
        const body = listed.length > 0 ? "" : await response.clone().text();
        if (listed.length > 0 || body.length > 0) {
          failures.push(`${what}: ${type || "a body"} is not among the documented [${listed.join(", ")}]`);
        }
        return;
      }
      if (!entry.schema || !media.includes("json")) return;
      const body: unknown = await response.clone().json();
      const validate = validator(`${method} ${schemaPath} ${response.status} ${media}`, entry.schema);
      validated += 1;
      if (!validate(body)) {
        failures.push(`${what} ${media}: ${ajv.errorsText(validate.errors)}: ${JSON.stringify(body).slice(0, 300)}`);
      }
    },
  };
  return { middleware, validated: () => validated, failures };
}
