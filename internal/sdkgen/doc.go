// Command sdkgen writes the SDKs' generated files from the API's OpenAPI
// document (producer/openapi.json), so their wire types and error tables
// cannot drift from it: sdk/python/kiln/_schema.py (a TypedDict per object
// schema, the enums, the problem type → exception class tables),
// sdk/typescript/src/schema.js with schema.d.ts (the enums and tables), and
// sdk/typescript/src/openapi.d.ts (openapi-typescript, default settings,
// from sdk/typescript's pinned devDependencies), of which index.d.ts makes
// the SDK's types. `make sdk` runs it; its test fails when a committed file
// is not what it would write now.
//
// Seam: generate (pure: the document in, the Python and JavaScript files
// out) and typeScript (runs Node).
//
// Invariants: every problem type of the document names an exception class
// (Problem's x-kiln-sdk-errors) or generation fails; the output depends on
// the document alone (its order kept), so a rerun is byte for byte the same.
package main
