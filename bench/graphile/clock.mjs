// The adapter's one clock, as bench/harness.py's: wall time in seconds, sub-millisecond.
//
// A pickup wait is one process's reading minus another's, so both must read the wall clock
// itself. performance.timeOrigin + performance.now() does not: its origin is one wall-clock
// reading taken at start-up and carried forward on the monotonic clock, and a repetition once
// read a negative median wait (-0.5 ms). So the offset from the monotonic clock to the wall
// clock is measured at a millisecond edge of Date.now() (the monotonic clock read late only
// lowers it: the highest of three is kept), and a reading taken between two equal Date.now()
// readings is kept inside their millisecond: a wall clock that moves is followed within one
// millisecond, without a pause (a reading split across an edge, or by a preemption, is left
// as it is rather than mistaken for a move).
import { performance } from "node:perf_hooks";

export function wallClock({ wall = Date.now, mono = () => performance.now() } = {}) {
  let offset = -Infinity;
  for (let i = 0; i < 3; i++) {
    const before = wall();
    let edge;
    while ((edge = wall()) === before) {}
    offset = Math.max(offset, edge - mono());
  }
  return () => {
    const ms = wall();
    let t = offset + mono();
    if (wall() === ms) {
      if (t < ms) {
        offset += ms - t;
        t = ms;
      } else if (t >= ms + 1) {
        offset -= t - (ms + 1);
        t = ms + 1;
      }
    }
    return t / 1000;
  };
}
