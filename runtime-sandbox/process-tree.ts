import { readdirSync, readFileSync } from "node:fs";

// A worker's processes as /proc shows them on the host, for killing what a function left running
// (local-process.ts, container.ts).

/** `pid` and its ancestors up to `top`, or null when `top` is not one of them (then nothing is killed). */
export function ancestry(pid: number, top: number): number[] | null {
  const out = [pid];
  for (let p = pid, depth = 0; p !== top; depth++) {
    if (depth > 8) return null;
    try {
      const stat = readFileSync(`/proc/${p}/stat`, "utf8");
      p = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
    } catch {
      return null;
    }
    if (!p) return null;
    out.push(p);
  }
  return out;
}

/** Every process below `root` (children are listed per thread). */
export function descendants(root: number): number[] {
  const out: number[] = [];
  const queue = [root];
  while (queue.length) {
    const pid = queue.shift()!;
    let tasks: string[];
    try {
      tasks = readdirSync(`/proc/${pid}/task`);
    } catch {
      continue;
    }
    for (const tid of tasks) {
      let list = "";
      try {
        list = readFileSync(`/proc/${pid}/task/${tid}/children`, "utf8");
      } catch {
        continue;
      }
      for (const c of list.split(" ")) {
        const child = Number(c);
        if (child) {
          out.push(child);
          queue.push(child);
        }
      }
    }
  }
  return out;
}

/** How many processes the pid namespace of `init` holds, from its own /proc; null when unreadable (no sandbox). */
export function sandboxProcesses(init: number): number | null {
  try {
    let n = 0;
    for (const e of readdirSync(`/proc/${init}/root/proc`)) if (e.charCodeAt(0) >= 48 && e.charCodeAt(0) <= 57) n++;
    return n;
  } catch {
    return null;
  }
}
