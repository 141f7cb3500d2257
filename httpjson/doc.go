// Package httpjson holds the rules every REST endpoint of a node applies to
// JSON: request bodies are read within a size bound, refused unless valid
// UTF-8 before any decoding (encoding/json would silently turn bad bytes into
// U+FFFD, merging distinct ids), decoded strictly into one JSON object with
// errors naming the field, and answers are encoded completely before the
// status line is written, so an encoding failure (a NaN, an infinity) becomes
// a logged 500 instead of a 200 with an empty body.
package httpjson
