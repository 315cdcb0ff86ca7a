# Kiln's Ruby bootstrap: loads the function once, then serves invocations one at a time.
# Protocol (see runtime-sandbox/worker.ts): one JSON object per line on fd 3, a socketpair shared
# with the pool (or on the unix socket KILN_CHANNEL names, in a container). puts/print/p/warn and $stdout/$stderr become log frames on that channel, so a
# stray line on stdout can never be mistaken for a response.
#
# argv: <task root> <entry, relative> <handler method name>
# The handler is a top-level method called as handler(event:, context:). context is a Struct:
# context.function_name / invocation_id / region / deadline_ms (also context[:function_name]),
# plus context.get_remaining_time_in_millis. A durable handler also takes step: (see Step below).
require "json"
require "stringio"

module KilnBootstrap
  TASK_ROOT, ENTRY, HANDLER = ARGV
  # In a container the channel is a unix socket Kiln listens on (KILN_CHANNEL), not an inherited fd.
  CHANNEL_PATH = ENV.delete("KILN_CHANNEL")
  CHANNEL_TOKEN = ENV.delete("KILN_CHANNEL_TOKEN")
  CHANNEL = if CHANNEL_PATH
    require "socket"
    # The first line on a container's channel proves it is this worker's bootstrap.
    UNIXSocket.new(CHANNEL_PATH).tap { |s| s.write(JSON.generate({ t: "hello", token: CHANNEL_TOKEN }) + "\n") }
  else
    IO.for_fd(3, "r+", autoclose: false)
  end
  CHANNEL.binmode
  CHANNEL.sync = true
  CHANNEL.close_on_exec = true # subprocesses of the function must not hold the channel
  LOCK = Mutex.new

  def self.send_frame(frame)
    data = JSON.generate(frame) + "\n"
    LOCK.synchronize { CHANNEL.write(data) }
  end

  def self.log(level, message)
    send_frame({ t: "log", l: level, m: message.to_s.dup.force_encoding(Encoding::UTF_8).scrub, ts: (Time.now.to_f * 1000).round })
  end

  # Line-buffered stand-in for $stdout/$stderr; the formatting methods reuse StringIO's.
  class LogIO
    def initialize(level, fd)
      @level = level
      @fd = fd
      @buf = +""
    end

    def write(*args)
      s = args.join
      @buf << s
      while (i = @buf.index("\n"))
        KilnBootstrap.log(@level, @buf.slice!(0, i + 1).chomp)
      end
      s.bytesize
    end

    def <<(obj)
      write(obj.to_s)
      self
    end

    %i[puts print printf putc].each do |m|
      define_method(m) do |*args|
        s = StringIO.new
        s.public_send(m, *args)
        write(s.string)
        nil
      end
    end

    def flush_partial
      return if @buf.empty?

      KilnBootstrap.log(@level, @buf)
      @buf = +""
    end

    def flush = self
    # Logger.new($stdout) takes only objects with both write and close for a device.
    def close = nil
    def closed? = false
    def sync = true
    def sync=(_v); end
    def fsync = 0
    def tty? = false
    def isatty = false
    # Code that needs a real descriptor gets the raw pipe, which the pool also turns into logs.
    def fileno = @fd
    def to_io = self
  end

  Context = Struct.new(:function_name, :invocation_id, :region, :deadline_ms, keyword_init: true) do
    def get_remaining_time_in_millis
      [0, deadline_ms - (Time.now.to_f * 1000).round].max
    end
  end

  def self.flush_partial
    [$stdout, $stderr].each { |io| io.flush_partial if io.is_a?(LogIO) }
  end

  BOOTSTRAP = File.expand_path(__FILE__)

  # Ruby's own report of an uncaught error (what `ruby` prints for it): the message line
  # `file:line:in 'method': message (Class)`, then `\tfrom file:line:in ...` frames, causes included.
  # The bootstrap's own frames are left out: they are the same in every function.
  def self.backtrace_of(e)
    bt = e.backtrace
    e.set_backtrace(bt.reject { |l| l.start_with?(BOOTSTRAP) }) if bt && bt.any? { |l| !l.start_with?(BOOTSTRAP) }
    e.full_message(highlight: false, order: :top).chomp
  rescue StandardError
    "#{e.class}: #{e.message}"
  end

  # --- durable executions ----------------------------------------------------------------------
  # A durable handler takes a step: keyword, handler(event:, step:, context:). Each step call takes
  # the next position; a position the journal settles is answered from it without running anything;
  # a new one runs, is reported, and returns only once Kiln has written it down. Kiln may answer
  # "suspend" (a sleep, a retry later, a stop): the invocation then ends at once.

  # Unwinds the handler when Kiln ends the invocation; not a StandardError, so `rescue => e` keeps out.
  class Suspend < Exception; end

  # The error of a failed step as the handler sees it: `type` is the original error's class name.
  class StepError < StandardError
    attr_reader :type

    def initialize(message, type = "StandardError")
      super(message)
      @type = type
    end
  end

  def self.await_ack(seq)
    # Only acks arrive while a handler runs (one invocation at a time).
    while (line = CHANNEL.gets)
      msg = JSON.parse(line)
      return msg if msg["t"] == "step_ack" && msg["seq"] == seq
    end
    exit!(0)
  end

  class Step
    def initialize(msg)
      @id = msg["id"]
      @journal = msg["durable"]["journal"].to_h { |e| [e["seq"], e] }
      @next = 0
    end

    # step.run("name", retries: 3) { ... }: the block's value (JSON) is the step's output.
    def run(name, retries: nil, &block)
      seq, e = position(name, "run")
      if e
        return e["output"] if e["status"] == "completed"

        err = e["error"] || {}
        raise StepError.new(err["message"].to_s, err["type"] || "StandardError")
      end
      raise ArgumentError, "step.run(#{name.inspect}) needs a block" unless block

      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      error = nil
      begin
        value = block.call
        frame = { status: "completed", output: JSON.parse(JSON.generate([value]))[0] }
      rescue StandardError => err
        error = err
        KilnBootstrap.log("error", KilnBootstrap.backtrace_of(err))
        frame = { status: "failed", error: { message: err.message, type: err.is_a?(StepError) ? err.type : err.class.name } }
      end
      frame[:retries] = retries unless retries.nil?
      ask({ seq: seq, name: name, op: "run", ms: (Process.clock_gettime(Process::CLOCK_MONOTONIC) - started) * 1000, **frame })
      raise StepError.new(frame[:error][:message], frame[:error][:type]) if error

      frame[:output]
    end

    # step.sleep("name", "1h") (or milliseconds); step.sleep_until("name", Time or RFC 3339).
    def sleep(name, duration)
      seq, e = position(name, "sleep")
      ask({ seq: seq, name: name, op: "sleep", duration: duration }) unless e
      nil
    end

    def sleep_until(name, instant)
      seq, e = position(name, "sleep")
      instant = instant.utc.strftime("%Y-%m-%dT%H:%M:%S.%LZ") if instant.respond_to?(:utc)
      ask({ seq: seq, name: name, op: "sleep", until: instant }) unless e
      nil
    end

    private

    def ask(frame)
      KilnBootstrap.send_frame({ t: "step", id: @id, **frame })
      ack = KilnBootstrap.await_ack(frame[:seq])
      raise Suspend if ack["action"] == "suspend"
      if ack["action"] == "throw"
        err = ack["error"] || {}
        raise StepError.new(err["message"].to_s, err["type"] || "StandardError")
      end
      ack
    end

    def position(name, op)
      raise TypeError, "the first argument of a step must be its name (a non-empty string)" unless name.is_a?(String) && !name.empty?

      seq = @next
      @next += 1
      e = @journal[seq]
      if e && (e["name"] != name || e["op"] != op)
        ask({ seq: seq, name: name, op: "mismatch",
              error: "non-deterministic replay: step #{seq + 1} was #{e["op"]} \"#{e["name"]}\" when the execution first ran, and is now #{op} \"#{name}\"" })
      end
      [seq, e]
    end
  end

  # The keywords the handler takes, of event:, step:, context: (all of them with **rest).
  def self.call_handler(receiver, msg, context)
    args = { event: msg["event"], context: context }
    args[:step] = Step.new(msg) if msg["durable"]
    params = receiver.method(HANDLER.to_sym).parameters
    unless params.any? { |kind, _| kind == :keyrest }
      accepted = params.filter_map { |kind, n| n if %i[key keyreq].include?(kind) }
      args = args.slice(*accepted)
    end
    receiver.send(HANDLER.to_sym, **args)
  end

  def self.describe(e)
    { error: e.message, type: e.is_a?(StepError) ? "StepError" : e.class.name }
  end

  def self.main
    $stdout = LogIO.new("info", 1)
    $stderr = LogIO.new("error", 2)
    begin
      $LOAD_PATH.unshift(TASK_ROOT)
      require File.join(TASK_ROOT, ENTRY)
      receiver = TOPLEVEL_BINDING.receiver
      raise NameError, "#{ENTRY} defines no method named \"#{HANDLER}\"" unless receiver.respond_to?(HANDLER.to_sym, true)
    rescue NoMemoryError => e
      log("error", backtrace_of(e))
      send_frame({ t: "fatal", kind: "out_of_memory", error: "NoMemoryError" })
      exit!(1)
    rescue Exception => e # SyntaxError, LoadError, SystemExit at load time...
      flush_partial
      log("error", backtrace_of(e))
      send_frame({ t: "init_error", **describe(e) })
      exit!(1)
    end
    send_frame({ t: "ready" })
    while (line = CHANNEL.gets)
      msg = JSON.parse(line)
      next unless msg["t"] == "invoke"

      c = msg["context"]
      context = Context.new(function_name: c["functionName"], invocation_id: c["invocationId"], region: c["region"], deadline_ms: c["deadlineMs"])
      begin
        value = call_handler(receiver, msg, context)
        data = JSON.generate({ t: "result", id: msg["id"], value: value })
      rescue Suspend
        # Kiln ended the invocation (a sleep, a retry later, a stop): nothing more to say.
        flush_partial
        send_frame({ t: "result", id: msg["id"], value: nil })
        next
      rescue NoMemoryError => e
        flush_partial
        log("error", backtrace_of(e))
        send_frame({ t: "fatal", kind: "out_of_memory", error: "NoMemoryError" })
        exit!(1)
      rescue StandardError, ScriptError => e
        flush_partial
        log("error", backtrace_of(e))
        send_frame({ t: "error", id: msg["id"], **describe(e) })
        next
      end
      flush_partial
      LOCK.synchronize { CHANNEL.write(data + "\n") }
    end
    # The pool closed the channel: nothing left to serve.
    exit!(0)
  end
end

KilnBootstrap.main
