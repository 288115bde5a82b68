// Run a command with a throwaway PostgreSQL server for the tests, and exit with its exit code.
//
//   node scripts/with-postgres.mjs <command...>     (the command runs through the shell)
//
// With LITTLE_TEST_DATABASE_URL already set, that server is used and nothing is started.
// Otherwise the PostgreSQL binaries are looked up (`pg_config --bindir`, else the highest
// /usr/lib/postgresql/*/bin, else `initdb` on PATH; LITTLE_TEST_PG_BIN names the directory
// instead, and a directory without them, such as /nonexistent, tests the path without them). A
// fresh cluster is made in a temporary directory, listening only on a unix socket there, with the
// default durability settings (fsync on). As root, initdb and pg_ctl run as the `postgres` user.
// The command gets:
//
//   LITTLE_TEST_DATABASE_URL  postgres://postgres@<socket dir, percent-encoded>:<port>/postgres
//   LITTLE_TEST_PG_CTL        JSON {"bin", "data", "runAs", "log"}: the pg_ctl binary, the data
//                             directory, the user to run it as (or null) and the server log, so a
//                             test can stop, start or restart the server. The cluster's settings
//                             are in its postgresql.conf, so `pg_ctl -D <data> -l <log> start`
//                             needs no options.
//
// The cluster is stopped and its directory removed when the command ends, fails, or this script
// is interrupted (SIGINT, SIGTERM, SIGHUP). Without the binaries this prints a `SKIPPED:` line and
// runs the command without a server, except under CI=true, where it exits 1 without running it.
import { spawnSync } from 'node:child_process';
import { appendFileSync, chmodSync, chownSync, existsSync, mkdtempSync, readFileSync, readdirSync, realpathSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { claim, commandOf, commandRunner, isExecutable, logTail, release } from './wrapper.mjs';

const FIRST_PORT = 54329;
const PORTS_TRIED = 100;
const START_TIMEOUT_S = 30;
const HOW_TO_ENABLE = "install Debian's postgresql (apt-get install postgresql), or set LITTLE_TEST_DATABASE_URL to a server the tests may use";

const say = (line) => process.stderr.write(`with-postgres: ${line}\n`);

const command = commandOf('with-postgres', say);

const hasServerBinaries = (dir) => isExecutable(join(dir, 'initdb')) && isExecutable(join(dir, 'pg_ctl'));

/** The directory holding initdb and pg_ctl, or null. */
function findBinaries() {
  const forced = process.env.LITTLE_TEST_PG_BIN;
  if (forced) return hasServerBinaries(forced) ? forced : null;
  const pgConfig = spawnSync('pg_config', ['--bindir'], { encoding: 'utf8' });
  if (pgConfig.status === 0) {
    const dir = pgConfig.stdout.trim();
    if (dir && hasServerBinaries(dir)) return dir;
  }
  const debian = '/usr/lib/postgresql';
  if (existsSync(debian)) {
    const versions = readdirSync(debian)
      .filter((v) => /^\d+(\.\d+)?$/.test(v))
      .sort((a, b) => Number(b) - Number(a));
    for (const v of versions) if (hasServerBinaries(join(debian, v, 'bin'))) return join(debian, v, 'bin');
  }
  for (const dir of (process.env.PATH ?? '').split(':')) {
    if (dir && isExecutable(join(dir, 'initdb'))) {
      const real = dirname(realpathSync(join(dir, 'initdb')));
      if (hasServerBinaries(real)) return real;
    }
  }
  return null;
}

// Signals to this script are passed on to the command (see scripts/wrapper.mjs).
const runCommand = commandRunner(command, say);

/** The uid and gid of a user, or null when there is none. */
function userIds(name) {
  const id = (flag) => spawnSync('id', [flag, name], { encoding: 'utf8' });
  const [u, g] = [id('-u'), id('-g')];
  if (u.status === 0 && g.status === 0) return { uid: Number(u.stdout), gid: Number(g.stdout) };
  try {
    const entry = readFileSync('/etc/passwd', 'utf8').split('\n').find((line) => line.startsWith(`${name}:`));
    if (entry) {
      const [, , uid, gid] = entry.split(':');
      return { uid: Number(uid), gid: Number(gid) };
    }
  } catch {
    // no /etc/passwd
  }
  return null;
}

/** A throwaway cluster, with everything needed to stop it and remove it. */
class Cluster {
  constructor(bin) {
    this.bin = bin;
    this.runAs = process.getuid?.() === 0 ? 'postgres' : null;
    this.dir = null;
    this.claim = null;
    this.started = false;
  }

  get data() {
    return join(this.dir, 'data');
  }

  get log() {
    return join(this.dir, 'server.log');
  }

  /** Run one of the PostgreSQL binaries, as the cluster's user; returns spawnSync's result. */
  run(tool, args, timeoutMs = 120_000) {
    const exe = join(this.bin, tool);
    const [file, argv] = this.runAs ? ['runuser', ['-u', this.runAs, '--', exe, ...args]] : [exe, args];
    // The tools look up the working directory, which must be readable by the cluster's user.
    return spawnSync(file, argv, { cwd: this.dir, encoding: 'utf8', timeout: timeoutMs });
  }

  /** Make and start the cluster; throws with what went wrong. */
  start() {
    const owner = this.runAs ? userIds(this.runAs) : null;
    if (this.runAs && !owner) throw new Error(`running as root, but there is no '${this.runAs}' user to run the server as (initdb refuses root)`);
    // A unix socket's path is limited to about 100 bytes.
    const base = tmpdir().length > 60 ? '/tmp' : tmpdir();
    this.port = this.claimPort(base);
    this.dir = mkdtempSync(join(base, `little-pg-${this.port}-`));
    chmodSync(this.dir, 0o755);
    if (owner) chownSync(this.dir, owner.uid, owner.gid);

    let init = this.run('initdb', ['-D', this.data, '-U', 'postgres', '--auth=trust', '-E', 'UTF8', '--locale=C.UTF-8']);
    if (init.status !== 0 && /locale/i.test(`${init.stdout}${init.stderr}`)) {
      rmSync(this.data, { recursive: true, force: true });
      init = this.run('initdb', ['-D', this.data, '-U', 'postgres', '--auth=trust', '-E', 'UTF8', '--locale=C']);
    }
    if (init.status !== 0) throw new Error(`initdb failed:\n${init.stdout ?? ''}${init.stderr ?? ''}${init.error ? init.error.message : ''}`);

    const quoted = (s) => `'${s.replace(/'/g, "''")}'`;
    appendFileSync(
      join(this.data, 'postgresql.conf'),
      [
        '',
        '# Test cluster of scripts/with-postgres.mjs: a unix socket in its own directory only.',
        "listen_addresses = ''",
        `unix_socket_directories = ${quoted(this.dir)}`,
        `port = ${this.port}`,
        'max_connections = 200',
        '',
      ].join('\n'),
    );

    const deadline = Date.now() + START_TIMEOUT_S * 1000;
    this.started = true; // from here on, cleanup tries to stop it
    const up = this.run('pg_ctl', ['-D', this.data, '-l', this.log, '-w', '-t', String(START_TIMEOUT_S), 'start'], (START_TIMEOUT_S + 5) * 1000);
    if (up.status !== 0) throw new Error(`the server did not start:\n${up.stdout ?? ''}${up.stderr ?? ''}${up.error ? up.error.message : ''}\n${this.logTail()}`);
    if (isExecutable(join(this.bin, 'pg_isready'))) {
      for (;;) {
        const ready = spawnSync(join(this.bin, 'pg_isready'), ['-q', '-h', this.dir, '-p', String(this.port), '-U', 'postgres', '-d', 'postgres'], { timeout: 5_000 });
        if (ready.status === 0) break;
        if (Date.now() > deadline) throw new Error(`the server does not accept connections after ${START_TIMEOUT_S} s\n${this.logTail()}`);
        Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 200);
      }
    }
  }

  /**
   * Claim a port number no other run of this script is using, by a file holding our pid. Each
   * socket is in its run's own directory, so this keeps concurrent runs' numbers (and with them
   * their shared-memory keys and log lines) apart rather than preventing a clash of sockets.
   */
  claimPort(base) {
    for (let port = FIRST_PORT; port < FIRST_PORT + PORTS_TRIED; port++) {
      const file = join(base, `little-pg-${port}.claim`);
      if (claim(file)) {
        this.claim = file;
        return port;
      }
    }
    throw new Error(`no free port number from ${FIRST_PORT} to ${FIRST_PORT + PORTS_TRIED - 1}`);
  }

  logTail() {
    return logTail(this.log);
  }

  env() {
    return {
      LITTLE_TEST_DATABASE_URL: `postgres://postgres@${encodeURIComponent(this.dir)}:${this.port}/postgres`,
      LITTLE_TEST_PG_CTL: JSON.stringify({ bin: join(this.bin, 'pg_ctl'), data: this.data, runAs: this.runAs, log: this.log }),
    };
  }

  /** Stop the server if it runs, remove its directory and release the port. Safe to call twice. */
  cleanup() {
    if (this.started && existsSync(join(this.data, 'postmaster.pid'))) {
      const pidText = readFileSync(join(this.data, 'postmaster.pid'), 'utf8').split('\n')[0];
      let stop = this.run('pg_ctl', ['-D', this.data, '-m', 'fast', '-w', '-t', '20', 'stop'], 30_000);
      if (stop.status !== 0) stop = this.run('pg_ctl', ['-D', this.data, '-m', 'immediate', '-w', '-t', '10', 'stop'], 15_000);
      if (stop.status !== 0) {
        try {
          process.kill(Number(pidText), 'SIGKILL');
        } catch {
          // not running
        }
      }
    }
    this.started = false;
    if (this.dir) rmSync(this.dir, { recursive: true, force: true });
    this.dir = null;
    if (this.claim) release(this.claim);
    this.claim = null;
  }
}

async function main() {
  if (process.env.LITTLE_TEST_DATABASE_URL) {
    say('using the server at LITTLE_TEST_DATABASE_URL');
    return runCommand(process.env);
  }
  const bin = findBinaries();
  if (!bin) {
    if (process.env.CI === 'true') {
      say(`error: PostgreSQL is required under CI=true, and its binaries (initdb, pg_ctl) were not found: ${HOW_TO_ENABLE}`);
      return 1;
    }
    console.warn(`SKIPPED: the PostgreSQL tests, since no PostgreSQL binaries (initdb, pg_ctl) were found: ${HOW_TO_ENABLE}`);
    return runCommand(process.env);
  }

  const cluster = new Cluster(bin);
  // A last resort, for when this script dies of an error of its own.
  process.on('exit', () => cluster.cleanup());
  try {
    cluster.start();
  } catch (e) {
    say(`could not start a PostgreSQL test cluster with ${bin}: ${e.message}`);
    cluster.cleanup();
    return 1;
  }
  const version = spawnSync(join(bin, 'postgres'), ['--version'], { encoding: 'utf8' }).stdout?.trim();
  say(`${version || 'PostgreSQL'} test cluster on ${cluster.dir}, port ${cluster.port}`);
  // Give a signal that came during the start a moment to be handled before the command runs.
  await new Promise((resolve) => setTimeout(resolve, 50));
  const code = await runCommand({ ...process.env, ...cluster.env() });
  cluster.cleanup();
  return code;
}

process.exit(await main());
