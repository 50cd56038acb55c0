#!/usr/bin/env bash
# Three execbox jail providers started one after another from one shell in a fresh cgroup: the
# shell's cgroup before and after each (301cb51: one execbox-service leaf, not one more per start).
cg=/sys/fs/cgroup/execbox-leaf-$$; mkdir -p $cg; echo $$ > $cg/cgroup.procs
echo "shell before: $(cat /proc/self/cgroup)"
for i in 1 2 3; do
  python3 -c "from execbox.providers.jail import JailProvider as J; p=J(); p.initialize({'pool_size':0,'preload':'none'}); i=p.create_instance(tenant_id='t', session_id='s'); print('run', p.execute_code(i.instance_id,'print(6*7)','python').stdout.strip(), 'own', open('/proc/self/cgroup').read().strip()); p.shutdown()"
  echo "shell after start $i: $(cat /proc/self/cgroup)"
done
find $cg -type d | sed "s|$cg|<group>|" | sort
