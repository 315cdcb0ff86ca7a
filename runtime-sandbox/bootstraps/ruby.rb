# Kiln's Ruby bootstrap: loads the function once, then serves invocations one at a time.
# Protocol (see runtime-sandbox/worker.ts): one JSON object per line on fd 3, a socketpair shared
# with the pool. puts/print/p/warn and $stdout/$stderr become log frames on that channel, so a
# stray line on stdout can never be mistaken for a response.
#
# argv: <task root> <entry, relative> <handler method name>
# The handler is a top-level method called as handler(event:, context:). context is a Struct:
# context.function_name / invocation_id / region / deadline_ms (also context[:function_name]),
# plus context.get_remaining_time_in_millis.
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

  def self.backtrace_of(e)
    ([("#{e.class}: #{e.message}")] + (e.backtrace || []).map { |l| "    #{l}" }).join("\n")
  end

  def self.describe(e)
    { error: e.message, type: e.class.name }
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
        value = receiver.send(HANDLER.to_sym, event: msg["event"], context: context)
        data = JSON.generate({ t: "result", id: msg["id"], value: value })
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
