/**
 * Processes and their TCP sockets as Linux /proc shows them, for the cluster tests (a primary's
 * workers; the sockets a process holds on a port).
 */
import { readdirSync, readFileSync, readlinkSync } from "node:fs";

/** The pids of a process's children; none once it is gone. */
export function childrenOf(pid: number): number[] {
  try {
    return readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8")
      .trim()
      .split(/\s+/)
      .filter(Boolean)
      .map(Number);
  } catch {
    return [];
  }
}

/** A cluster primary's worker processes: its children running src/main.ts (the engine is another). */
export function workerPidsOf(primaryPid: number): number[] {
  return childrenOf(primaryPid).filter((pid) => {
    try {
      return readFileSync(`/proc/${pid}/cmdline`, "utf8").includes("src/main.ts");
    } catch {
      return false;
    }
  });
}

/** A TCP socket of /proc/net/tcp{,6}: its state (hex, `0A` = LISTEN), receive queue and inode. */
export interface TcpSocket {
  readonly state: string;
  /** For a listening socket, the connections waiting in its accept queue. */
  readonly rxQueue: number;
  readonly inode: string;
}

/** The TCP sockets process `pid` holds whose local port is `port`. */
export function tcpSocketsOnPort(pid: number, port: number): TcpSocket[] {
  const inodes = new Set<string>();
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`));
      if (m?.[1] !== undefined) inodes.add(m[1]);
    } catch {
      // closed meanwhile
    }
  }
  const found: TcpSocket[] = [];
  for (const table of ["/proc/net/tcp", "/proc/net/tcp6"]) {
    for (const line of readFileSync(table, "utf8").split("\n").slice(1)) {
      const f = line.trim().split(/\s+/);
      const local = f[1]?.split(":").pop();
      if (local === undefined || Number.parseInt(local, 16) !== port || !inodes.has(f[9] ?? "")) continue;
      found.push({
        state: f[3] ?? "",
        rxQueue: Number.parseInt(f[4]?.split(":")[1] ?? "0", 16),
        inode: f[9] ?? "",
      });
    }
  }
  return found;
}
