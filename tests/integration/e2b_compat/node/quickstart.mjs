// E2B's JavaScript quickstart, unmodified SDK calls; configured only by E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY. Prints one JSON line the Python test checks.
import { Sandbox } from '@e2b/code-interpreter'

const sbx = await Sandbox.create({ timeoutMs: 120_000 })
try {
  const execution = await sbx.runCode('x = 40\nprint("from python")\nx + 2')
  const js = await sbx.runCode('console.log("from node")', { language: 'javascript' })
  const cmd = await sbx.commands.run('echo hello from bash')
  await sbx.files.write('/home/user/node.txt', 'written by node')
  const text = await sbx.files.read('/home/user/node.txt')
  const names = (await sbx.files.list('/home/user')).map((e) => e.name)
  console.log(JSON.stringify({
    text: execution.text, stdout: execution.logs.stdout, jsStdout: js.logs.stdout,
    cmd: cmd.stdout, file: text, names, running: await sbx.isRunning(),
  }))
} finally {
  await sbx.kill()
}
