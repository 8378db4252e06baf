// e2e.mjs: E2B's own JavaScript SDK (npm package `e2b`, unmodified) against cube-api.
//
// Configured only through the SDK's documented settings:
//   E2B_API_URL=http://HOST:PORT      cube-api (the REST routes)
//   E2B_SANDBOX_URL=http://HOST:PORT  cube-api too (it serves E2B's envd protocol itself)
//   E2B_API_KEY=KEY                   one of cube-api's API keys
// and, for this program, CUBE_E2B_TEMPLATE (an image in cube-api's namespace, a template or a snapshot).
//
// The story, each step checked: create a sandbox → run commands (output, exit code, a failing one, a
// background one listed and killed) → write, read and list files, a directory made and removed → list
// sandboxes, set the timeout → snapshot it → create a sandbox from the snapshot (it has the file) →
// pause and connect → fork (when the SDK has it) → kill every sandbox and delete the snapshot.
// Exits 1 naming the step that did not hold (after cleaning up), 0 when every step held.
//
//   node e2e.mjs [--no-restored-files] [--no-pause] [--no-fork]
// (--no-restored-files: the unit tests' fake backend does not carry files into a restored sandbox.)
import { Sandbox, CommandExitError, NotFoundError } from 'e2b'

const flags = new Set(process.argv.slice(2))
const template = process.env.CUBE_E2B_TEMPLATE || 'docker.io/cube/e2e:latest'
const made = []
const snapshots = []
const t0 = Date.now()

function log(msg) {
	console.log(`[${((Date.now() - t0) / 1000).toFixed(1)}s] ${msg}`)
}
function check(cond, what) {
	if (!cond) throw new Error(`step did not hold: ${what}`)
	log(`ok: ${what}`)
}

async function main() {
	const sb = await Sandbox.create(template, { timeoutMs: 300_000, metadata: { e2e: 'e2b-js' } })
	made.push(sb)
	check(typeof sb.sandboxId === 'string' && sb.sandboxId.length > 0, `Sandbox.create(${template}) → ${sb.sandboxId}`)

	const r = await sb.commands.run('echo hello from e2b; echo to-stderr >&2')
	check(r.exitCode === 0 && r.stdout === 'hello from e2b\n', `commands.run: stdout ${JSON.stringify(r.stdout)}, exit code ${r.exitCode}`)
	check(r.stderr === 'to-stderr\n', `commands.run: stderr ${JSON.stringify(r.stderr)}`)
	let exitErr
	try {
		await sb.commands.run('echo failing; exit 3')
	} catch (e) {
		exitErr = e
	}
	check(exitErr instanceof CommandExitError && exitErr.exitCode === 3 && exitErr.stdout === 'failing\n',
		`commands.run of a failing command throws CommandExitError with exitCode ${exitErr && exitErr.exitCode}`)
	const out = []
	await sb.commands.run('echo streamed', { onStdout: (d) => out.push(d) })
	check(out.join('') === 'streamed\n', 'commands.run onStdout streams the output')
	const bg = await sb.commands.run('sleep 600', { background: true })
	const procs = await sb.commands.list()
	check(procs.some((p) => p.pid === bg.pid), `a background command (pid ${bg.pid}) is in commands.list`)
	check(await sb.commands.kill(bg.pid), 'commands.kill of the background command')
	const killed = await bg.wait().catch((e) => e)
	check(killed instanceof CommandExitError && killed.exitCode === 137, `the killed command ends with ${killed && killed.exitCode}`)

	const info = await sb.files.write('/tmp/e2b/hello.txt', 'hello file\n')
	check(info.path === '/tmp/e2b/hello.txt' && info.name === 'hello.txt', `files.write → ${JSON.stringify(info)}`)
	check((await sb.files.read('/tmp/e2b/hello.txt')) === 'hello file\n', 'files.read gives what was written')
	const bytes = await sb.files.read('/tmp/e2b/hello.txt', { format: 'bytes' })
	check(bytes instanceof Uint8Array && bytes.length === 11, 'files.read as bytes')
	const cat = await sb.commands.run('cat /tmp/e2b/hello.txt')
	check(cat.stdout === 'hello file\n', 'a command reads the file written')
	const entries = await sb.files.list('/tmp/e2b')
	check(entries.some((e) => e.name === 'hello.txt' && e.type === 'file' && e.size === 11), `files.list: ${entries.map((e) => e.name).join(', ')}`)
	check(await sb.files.makeDir('/tmp/e2b/dir'), 'files.makeDir')
	check((await sb.files.getInfo('/tmp/e2b/dir')).type === 'dir', 'files.getInfo of the directory')
	await sb.files.remove('/tmp/e2b/dir')
	check(!(await sb.files.exists('/tmp/e2b/dir')), 'files.remove, files.exists')
	let nf
	try {
		await sb.files.read('/tmp/e2b/missing')
	} catch (e) {
		nf = e
	}
	check(nf instanceof NotFoundError, `files.read of a missing file throws ${nf && nf.name}`)

	const listed = await Sandbox.list({ query: { metadata: { e2e: 'e2b-js' } } }).nextItems()
	check(listed.some((s) => s.sandboxId === sb.sandboxId && s.state === 'running'), 'Sandbox.list with a metadata filter')
	const before = (await sb.getInfo()).endAt
	await sb.setTimeout(600_000)
	const after = (await sb.getInfo()).endAt
	check(after > before, `setTimeout moves the end from ${before.toISOString()} to ${after.toISOString()}`)
	const again = await Sandbox.connect(sb.sandboxId)
	check((await again.commands.run('echo connected')).stdout === 'connected\n', 'Sandbox.connect, then a command through it')

	const snap = await sb.createSnapshot()
	snapshots.push(snap.snapshotId)
	check(typeof snap.snapshotId === 'string' && snap.snapshotId.length > 0, `createSnapshot → ${snap.snapshotId}`)
	const sb2 = await Sandbox.create(snap.snapshotId, { timeoutMs: 300_000 })
	made.push(sb2)
	check(sb2.sandboxId !== sb.sandboxId, `Sandbox.create(snapshotId) → ${sb2.sandboxId}`)
	if (!flags.has('--no-restored-files')) {
		check((await sb2.files.read('/tmp/e2b/hello.txt')) === 'hello file\n', 'the sandbox from the snapshot has the file')
	}
	const r2 = await sb2.commands.run('echo from the snapshot')
	check(r2.exitCode === 0 && r2.stdout === 'from the snapshot\n', 'a command in the sandbox from the snapshot')

	if (!flags.has('--no-pause')) {
		check(await sb2.betaPause(), 'betaPause')
		check((await sb2.getInfo()).state === 'paused', 'paused')
		await sb2.connect()
		check((await sb2.getInfo()).state === 'running', 'connect resumes it')
		check((await sb2.commands.run('echo resumed')).stdout === 'resumed\n', 'a command after the resume')
	}

	if (!flags.has('--no-fork') && typeof sb.fork === 'function') {
		const forks = await sb.fork({ count: 1 })
		for (const f of forks) if (f instanceof Sandbox) made.push(f)
		check(forks.length === 1 && forks[0] instanceof Sandbox, `fork({count: 1}) → ${forks.map((f) => f.sandboxId || f.message)}`)
		const rf = await forks[0].commands.run('echo from the fork')
		check(rf.stdout === 'from the fork\n', 'a command in the fork')
	}

	for (const s of made.splice(0)) {
		check(await s.kill().then(() => true), `kill ${s.sandboxId}`)
	}
	check(!(await Sandbox.kill(sb.sandboxId)), 'Sandbox.kill of a killed sandbox says false')
	check(await Sandbox.deleteSnapshot(snap.snapshotId), 'Sandbox.deleteSnapshot')
	snapshots.length = 0
}

let rc = 0
try {
	await main()
	log('every step held')
} catch (e) {
	console.error(`e2e: ${e && e.stack ? e.stack : e}`)
	rc = 1
} finally {
	for (const s of made) await s.kill().catch((e) => console.error(`cleanup: kill ${s.sandboxId}: ${e}`))
	for (const id of snapshots) await Sandbox.deleteSnapshot(id).catch((e) => console.error(`cleanup: delete snapshot ${id}: ${e}`))
}
process.exit(rc)
