// `toolnexus serve` as a child process for the console tests: started with
// `args` (after "serve"), resolved with {proc, url} once it prints
// "listening on <url>", rejected with its stderr if it exits first.
// Env: TNX_BIN (the toolnexus program).
import { spawn } from "node:child_process";

export function startServe(args, env = process.env) {
  const proc = spawn(process.env.TNX_BIN, ["serve", ...args], { env, stdio: ["ignore", "pipe", "pipe"] });
  let err = "";
  proc.stderr.on("data", (d) => { err += d; });
  return new Promise((resolve, reject) => {
    let out = "";
    proc.stdout.on("data", (d) => {
      out += d;
      const m = /^listening on (http:\/\/[^/]+\/)/m.exec(out);
      if (m) resolve({ proc, url: m[1] });
    });
    proc.on("exit", (code) => reject(new Error("toolnexus serve exited " + code + ": " + err)));
  });
}

// SIGTERM, then waits for the exit.
export async function stopServe(s) {
  const gone = new Promise((resolve) => s.proc.on("exit", resolve));
  s.proc.kill("SIGTERM");
  await gone;
}
