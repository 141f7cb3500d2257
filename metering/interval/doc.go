// Package interval is the pure planning arithmetic of continuous-usage
// metering: where granularity boundaries lie in a
// time zone, and which interval a span samples next. It knows nothing of raft,
// storage or sinks, so its rules can be tested exhaustively.
//
// Rules (all times are Unix milliseconds):
//
//   - Boundaries: the starts of minutes, hours, days or months in the
//     configured location (UTC by default).
//   - An interval never crosses a boundary. A forward interval is [start, end)
//     and a backward one (start, end]; either lies inside one granularity
//     window [b, next(b)) (a backward interval may end exactly on next(b),
//     which holds no time of its own).
//   - The usage timestamp is the midpoint ⌊(start+end)/2⌋, which always lies in
//     the interval's window, in both directions.
//   - The duration measure is end−start for a forward interval and
//     start−end (negative) for a backward one.
//   - An open span is sampled up to the last boundary at or before now, so a
//     window is reported once it has elapsed; a stopped span up to its end once
//     now has reached it. A late stop (end before what was already sampled)
//     walks back boundary by boundary with backward intervals until the
//     cursor reaches end.
//   - A zero-length interval is never planned: a span whose cursor already is
//     its end is complete.
//
// Conservation follows: every interval moves the span's cursor by its signed
// duration, the cursor starts at start and finishes at end, and each interval
// lies in one window, so per window the durations add up to the overlap of
// [start, end) with that window, exactly.
package interval
