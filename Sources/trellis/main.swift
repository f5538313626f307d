import Foundation
import Trellis

// The commands that run until stopped take SIGINT and SIGTERM themselves: block them before any
// thread starts (Signals.swift). Every other command keeps the default (Ctrl-C ends it).
let commandLine = Array(CommandLine.arguments.dropFirst())
if commandLine.first == "node" || (commandLine.first == "contacts" && commandLine.dropFirst().first == "mirror") {
    Signals.block()
} else {
    // Ctrl-C ends any other command at once (the shell with status 130 as the calling shell
    // reports it), whatever disposition the parent left SIGINT in.
    Signals.restoreDefault()
    // SIGTERM stops the shell as the end of its input would, with status 143 (NodeCommand).
    if commandLine.first == "shell" { Signals.block([SIGTERM]) }
}

let usage = """
    trellis — a peer-to-peer mesh replication node

    Usage:
      trellis node   --data DIR [--listen HOST:PORT] [--peer HOST:PORT]... --mesh-key FILE [--subscribe 'COLLECTION [QUERY]']...
      trellis shell  --data DIR [--listen HOST:PORT] [--peer HOST:PORT]... --mesh-key FILE
      trellis attach --data DIR [--keep-going | --bail]
      trellis status --data DIR [--json]
      trellis import --data DIR COLLECTION FILE [--all-or-nothing]
      trellis find   --data DIR COLLECTION [QUERY] [sort PATH [asc|desc]]... [limit N] [offset N] [--count]
      trellis get    --data DIR COLLECTION ID
      trellis keygen FILE
      trellis contacts import|list|export|mirror --data DIR …
      trellis simulate [--seeds N] [--nodes M] [--faults LIST] | --replay SEED
      trellis --version

    `attach` opens a shell on the node running on DIR, `status` prints its status, and `import`
    goes through it while it runs (its control socket DIR/control.sock).
    Run `trellis COMMAND --help` for a command's details.
    """

let arguments = Array(CommandLine.arguments.dropFirst())
guard let command = arguments.first else {
    print(usage)
    exit(2)
}
let rest = Array(arguments.dropFirst())

do {
    switch command {
    case "node": try NodeCommand.run(rest, interactive: false)
    case "shell": try NodeCommand.run(rest, interactive: true)
    case "import": try ImportCommand.run(rest)
    case "attach": try AttachCommand.run(rest)
    case "status": try StatusCommand.run(rest)
    case "find", "get": try InspectCommand.run(command, rest)
    case "keygen": try KeygenCommand.run(rest)
    case "contacts": try ContactsCommand.run(rest)
    case "simulate": try SimulateCommand.run(rest)
    case "--help", "-h", "help": print(usage)
    case "--version", "version": print("trellis \(TrellisVersion.current) (protocol \(TrellisVersion.protocolVersion))")
    default: throw UsageError("unknown command '\(command)'; run `trellis --help`")
    }
} catch {
    // One line, whatever the error's own text holds.
    FileHandle.standardError.write(Data(Control.errorLine(error).utf8))
    exit(error is UsageError ? 2 : 1)
}
