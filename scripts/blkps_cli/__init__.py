"""The `blkps` command (scripts/blkps): one option parser and one way of
printing errors for everything a person runs on a blkps server or learner
node. Modules, one job each:

  errors     UserError and the parser that prints `blkps: <what>: <why>; <what to do>`
  tools      where the built or installed programs are (tgtd plugin, blkps-layout, ...)
  state      target.env and shards.env: the one writer and reader
  arguments  the value types of the commands' options
  target     blkps target start|stop|show|watch: the commands of a server
  serve      blkps target serve: the server in the foreground (Slurm, systemd), its part of a model
  publish    a job's published layout (serve --publish, blkps layout wait)
  restart    blkps target restart: restart the tgtds that died
  scaleout   one model served by N co-located tgtds (target start --tgtd N)
  shards     blkps shards start|stop: one model striped over several targets
  tgtd       one private tgtd: start (typed Options), tgtadm, stop, what a restart needs
             (the layers run one way: commands -> scaleout -> shards -> tgtd)
  control    blkps status|set: the control LUN
  session    the iSCSI session settings, one table for target start and login
  chap       the CHAP credentials file (--chap-file, BLKPS_CHAP_FILE)
  login      blkps login|logout|node-status: the kernel initiator (iscsiadm, dmsetup, mdadm)
  node       blkps mount, blkps layout
  demo       blkps demo: README's main job
  main       the command line
"""
